"""Report sections, discovered by module; each declares ORDER, ID, TITLE, TEMPLATE and build(ctx)."""
