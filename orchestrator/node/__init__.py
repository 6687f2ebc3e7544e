"""What runs on the nodes: programs sent there as text, and the parsers of what they print."""
