# The pyhami image: the decision daemon (pyhami scheduler), the node agent (pyhami agent)
# and the demo, from one package.
#   docker build -t pyhami:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY common ./common
COPY agent ./agent
COPY scheduler ./scheduler
COPY pyhami ./pyhami
RUN pip install . && rm -rf /src \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin pyhami

WORKDIR /
USER 10001
EXPOSE 8888 9395
CMD ["pyhami", "--help"]
