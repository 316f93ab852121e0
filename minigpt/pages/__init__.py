"""Page rendering: every generated table, fragment and figure the course's pages include, in
English and Spanish, one module per page or lab, with the language helpers (:mod:`lang`).

* :mod:`theory`, :mod:`figures` - the theory pages' tables and the drawn figures (theory and
  Lab 02), computed from :mod:`minigpt.zero`; :mod:`site` registers them and ``python -m
  minigpt.pages`` (``make docs``) writes them to ``build/tables/`` and ``figures/``, and
  :mod:`inline` writes every table and measured fragment into the pages that show them;
* :mod:`lab01_benchmark`, :mod:`lab01_check` - Lab 01's measured tables and timeline;
* :mod:`lab02`, :mod:`lab02_crosscheck` - Lab 02's model tables and its cross-check;
* :mod:`lab03_reading`, :mod:`lab03_prefetch`, :mod:`lab03_practice` - Lab 03's annotated
  reading, prefetch timelines and FSDP-in-practice tables.

The lab modules read the results JSON a runner wrote (``lab/results/*.json``) and write the
fragments beside it (``*-en.txt``, ``*-es.txt``, ``*.png``). Nothing here trains or starts processes.
"""
