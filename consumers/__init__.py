"""The Kafka side of contextcore: faststream consumer apps, topics, and the dev stack."""
