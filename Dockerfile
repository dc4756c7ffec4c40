# The pyhami image: the decision daemon (pyhami scheduler), the node agent (pyhami agent)
# and the demo, from one package. The image installs the wheel that scripts/build-dist.sh
# builds, the same wheel the packaging test installs into a fresh virtual environment.
#   docker build -t pyhami:0.1.0 .
FROM python:3.11-slim AS dist

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN pip install build
COPY pyproject.toml README.md ./
COPY scripts/build-dist.sh ./scripts/
COPY common ./common
COPY agent ./agent
COPY scheduler ./scheduler
COPY pyhami ./pyhami
RUN scripts/build-dist.sh /dist

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=dist /dist /dist
RUN pip install /dist/pyhami-*.whl && rm -rf /dist \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin pyhami \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/pyhami

USER 10001
EXPOSE 8443 8888 9395
CMD ["pyhami", "--help"]
