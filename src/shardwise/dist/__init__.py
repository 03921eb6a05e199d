"""The only package that talks to ``torch.distributed``: rank discovery and collectives."""

from shardwise.dist.world import resolve_world

__all__ = ["resolve_world"]
