"""The native attention kernel: its arguments, its SBUF plan and its tracer."""
