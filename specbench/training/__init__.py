"""The training wing: drafters (``distill``: feature-level draft heads from the target's own features and
top-k distributions; ``finetune``: existing small models; ``drafter``: the trainees, the target's cached answers
and the epoch loop of ``specbench train-drafter``) and the context-aware policy (``policy``: REINFORCE on
collected rewards, for ``specbench train-policy``). Pipelines run them; inference never imports them."""
