"""The decisions: every rule's check, the mutation, and the Handlers that turn an AdmissionRequest and the
policy in force into a Response. Pure: no I/O, no logging."""
