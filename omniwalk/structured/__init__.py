"""Structured outputs and tool calls: what a request's output must follow (``grammars``), the grammar
engine's matchers in the sampler (``matchers``), and the model's tool calls read back out of its text
(``tools``)."""
