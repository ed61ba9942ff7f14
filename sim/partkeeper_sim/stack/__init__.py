"""The embedded stack (`partkeeper up`): NATS, the simulated cluster and the four services."""
