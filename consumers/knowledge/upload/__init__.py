"""The upload consumer: admin uploads in, embedding batches and status replies out."""
