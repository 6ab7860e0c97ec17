"""Framework adapters: PyTorch, TensorFlow, JAX/numpy. Each imports its framework lazily,
only when called."""

__all__ = ["torch", "tf", "jax"]
