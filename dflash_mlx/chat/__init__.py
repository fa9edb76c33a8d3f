"""A chat session without a terminal: history, prompt-cache reuse across turns, slash
commands and transcripts. The CLI (`dflash-mlx chat`) only draws it.

session.py (ChatSession, Settings) · turn.py (one answer: pieces, text, ids) ·
stats.py (per answer and per session, what the engine did) · commands.py (slash
commands) · transcript.py (JSON / Markdown) · markdown.py (a streamed answer cut into
Markdown blocks) · history.py (what the user typed, for the next session). Prompt
rendering is `dflash_mlx.conversation`. May
import anything of the library below the commands (the text API, loading, the engine,
base modules); never bench/, serve/, train/ or cli/.
"""

from .commands import COMMANDS
from .session import ChatSession, Settings
from .stats import TurnStats
from .turn import Chunk, Piece

__all__ = ["COMMANDS", "ChatSession", "Chunk", "Piece", "Settings", "TurnStats"]
