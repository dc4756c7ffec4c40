"""What the agent and the scheduler share: the decision core, wire models, settings."""
