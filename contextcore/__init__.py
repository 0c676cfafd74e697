"""contextcore: the domain of the context service.

Models, subject keys, token estimates, the source registry, the packer and the builder, plus the
storage layer (pool, tenancy, migrations). Nothing here imports Kafka code; the consumers and
producers packages are the only adapters to the broker.
"""

__version__ = "0.1.0"
