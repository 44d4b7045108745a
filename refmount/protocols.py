"""The URL protocols whose targets are files on this machine.

Named once, below every layer: the fetcher reads them itself, the resolver refuses them
for a remote reference set, and redaction shows them whole (a local path has no secrets).
"""

LOCAL_PROTOCOLS = frozenset({"file", "local"})
