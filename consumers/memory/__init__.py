"""The memory consumer: memory.remember and memory.forget calls from the memory-write topic."""
