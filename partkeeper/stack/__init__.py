"""The embedded stack (`partkeeper up`) and `partkeeper status`."""
