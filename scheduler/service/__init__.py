"""The scheduler service: store, inventory, executor and scheduling loop."""
