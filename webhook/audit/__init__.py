"""What already runs: the audit over the live cluster, its reports, and the periodic audit process."""
