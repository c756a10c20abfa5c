"""The release path every pipeline shares: quality gate, versioned publishing, artifact stores, model registry."""
