"""The block loop in token ids (`loop`) and what steers it: the acceptance rules
(`verify`), the block-size policies (`policy`), timing them before the first answer
(`calibrate`) and a sharded target's ranks in lockstep (`lockstep`).

May import the base modules, `backend` and `models`; never text, loading or anything
above (the text API, `generate`, sits on top of it).
"""
