"""The engine interface served by SGLang servers: this service stays the front (audio, chunking,
grammars, parsing, formats, streaming, realtime, auth, metrics); SGLang decodes.

``wire`` speaks SGLang's native ``/generate`` format, ``backends`` keeps the servers' state and
picks one per decode, ``engine`` admits servers (canary decodes) and runs each sequence as one
streamed ``/generate`` call.
"""

from .backends import Backend, BackendPool
from .engine import SGLangEngine
from .wire import Carrier

__all__ = ["Backend", "BackendPool", "Carrier", "SGLangEngine"]
