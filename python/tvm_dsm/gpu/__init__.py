"""GPU workflow: build and export kernels here (export), check and time them there (run)."""
