"""Reading manifests: YAML and JSON streams read a document at a time, positions of fields, and the inputs
`check` reads (files, directories, stdin, Lists expanded, the saved cluster state)."""
