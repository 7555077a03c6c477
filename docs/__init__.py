"""The documentation pages (built by mkdocs, see mkdocs.yml) and their generator, docs.gen."""
