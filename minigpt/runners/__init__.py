"""The lab runners: one module per lab script (``lab/NN_name.py`` runs ``runners/labNN_name.py``).

A runner parses and checks the script's arguments before any work, starts the processes' group
(through :mod:`minigpt.parallel.launch`), runs the mechanisms of :mod:`minigpt.parallel`,
:mod:`minigpt.zero` or :mod:`minigpt.fsdp` on MiniGPT, and writes what it measured as a results
JSON (``lab/results/`` for the committed ones). The page's tables and figures are drawn from that
JSON by :mod:`minigpt.pages` (each runner's ``--render JSON``), never by the runner itself.
"""
