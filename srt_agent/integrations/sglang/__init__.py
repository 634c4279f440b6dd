"""SRT inside SGLang: its tree layout, a model of its verification rule, and the drafter plugin."""
