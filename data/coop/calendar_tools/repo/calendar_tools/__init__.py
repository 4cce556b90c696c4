"""calendar_tools: a small library (a cooperative-coding task of SCOPE-MARL)."""
