"""The documentation pages (built by zensical from mkdocs.yml) and their generator, docs.gen."""
