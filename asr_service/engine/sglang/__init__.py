"""The engine interface served by SGLang servers: this service stays the front (audio, chunking,
grammars, parsing, formats, streaming, realtime, auth, metrics); SGLang decodes.

``wire`` speaks SGLang's native ``/generate`` format, ``backends`` keeps the servers' state and
picks one per decode, ``engine`` runs each sequence as one streamed ``/generate`` call.
"""

from .backends import Backend, BackendPool
from .engine import SGLangEngine

__all__ = ["Backend", "BackendPool", "SGLangEngine"]
