"""The training wing: drafters (``distill``: feature-level draft heads from the target's own features and
top-k distributions; ``finetune``: existing small models; ``trainees``: what each drafter kind trains and how it
is scored; ``recipe``: train-drafter's settings and its training sequences; ``responses``: the target's cached
answers; ``fit``: the optimiser loop of ``specbench train-drafter``)
and the context-aware policy (``reinforce``: REINFORCE on collected rewards, for ``specbench train-policy``).
Pipelines run them; inference never imports them."""
