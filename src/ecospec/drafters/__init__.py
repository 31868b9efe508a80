"""Drafters propose draft tokens: EAGLE-3 heads, a separate draft LM."""
