"""The experience operators that call a judge model, registered in ``EXPERIENCE_OPS`` (on its first use).

They are written with the other judges (``rewards/ruler.py``), which know nothing of the buffer; the buffer
names them here, so the import runs down the layers (buffer -> rewards) and never back up.
"""

from trivium.buffer.operators import EXPERIENCE_OPS
from trivium.rewards.ruler import ruler

EXPERIENCE_OPS.register("ruler")(ruler)
