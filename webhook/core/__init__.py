"""The model every decision reads: field paths and violations, quantities, pod specs, the vendor registry,
the rule table, the policy, the cluster view and the AdmissionReview wire format. Pure: no I/O."""
