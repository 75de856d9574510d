"""The debate itself, with no I/O: problem sources (``problems``), the chat each role sees
(``prompts``), reading answers (``answers``, ``closed_form``), the episode state machine
(``episode``) and the rewards record (``rewards``). May import ``protocol``."""
