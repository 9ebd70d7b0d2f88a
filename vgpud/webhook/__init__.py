"""The admission webhook: the vGPU rules (pure, `rules`), AdmissionReview handling (pure, `review`), and
the HTTPS server that applies them (`vgpud webhook`)."""
