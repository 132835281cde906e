"""The gRPC edge: Danube-compatible services, the batch lane, admin, metrics, and the broker process."""
