"""Native admission policies: the rules CEL can express, generated as ValidatingAdmissionPolicy and
MutatingAdmissionPolicy objects from the same rule table the webhook uses."""
