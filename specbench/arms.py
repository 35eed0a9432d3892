"""The name every layer shares for the arm that does not draft: one ordinary target step per round."""

AUTOREGRESSIVE = "autoregressive"
