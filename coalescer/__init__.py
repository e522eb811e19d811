"""The coalescer: the scheduler's front door to the prediction replicas (see ``coalescer.app``)."""
