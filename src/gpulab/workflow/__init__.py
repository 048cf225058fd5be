"""The workflow's plumbing: the step runner, configuration, sources, failures and outcomes."""
