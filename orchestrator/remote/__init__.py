"""The SSH layer: keys, connections and file transfer to hosts. Knows hosts, never clouds."""
