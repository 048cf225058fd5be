"""The self-contained HTML report: one jinja2 template and one module per section."""
