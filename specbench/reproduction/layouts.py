"""What each scale's runs hold (``Layout``): which drafter plays which part, which MetaSD runs hold which
specialists, and the notes that name the models."""

from __future__ import annotations

from specbench.reproduction.exhibit import ACCEPTANCE_REWARD_NOTE, GENERALIST, SPECIALISTS, Layout, MetaRun
from specbench.reproduction.runs import HELD_OUT, METASD_EAGLE, METASD_EVAL

CPU = Layout(
    name="cpu",
    scale="CPU scale",
    huang_pair={
        "eagle_translation": ("translation", "T5-small"),
        "eagle_summarization": ("summarization", "T5-small-XSum"),
    },
    huang_models="SmolLM2-135M with its translation and summarization draft heads",
    held_out=f"{HELD_OUT} (per source)",
    table1_reward=ACCEPTANCE_REWARD_NOTE,
    table4_reward=ACCEPTANCE_REWARD_NOTE,
    alpha_arms=("small", "quantized"),
    alpha_note=(
        "the standalone small drafter (2 trained layers of SmolLM2 on an 8k sub-vocabulary: cheap, fairly aligned) "
        "and the int8 copy of the whole target (dear, best aligned), on XSum"
    ),
    depth_note=(
        "Drafters of SmolLM2 at several depths whose alignments differ: the small drafter (2 trained layers), "
        "untrained early exits after 16 and 24 of 30 layers (they accept few tokens), and the int8 copy of all 30 "
        "(the paper-scale run uses LayerSkip's trained exits)"
    ),
    training_note="the paper trains on 1k-10k queries, this CPU run on at most the collected ones.",
    metasd=(
        MetaRun(
            METASD_EVAL,
            "metasd/main",
            "MetaSD, main table: single drafters, baselines and bandits on a mixed stream",
            SPECIALISTS,
            GENERALIST,
            ucb_row="MetaSpS-UCB",
            setting="one mixed, interleaved stream of the local real data (published values: other tasks and "
            "drafters, so set beside, not compared)",
        ),
    ),
    stream_note=(
        "The task changes inside each conversation: the stream's 20 queries (local data, in task blocks) are "
        "the turns of three chats (8, 8 and 4 turns: conversation_length 8), each turn prompted after the earlier "
        "turns of its chat and the model's own answers; the selectors' statistics carry over throughout."
    ),
)

PAPER = Layout(
    name="paper",
    scale="paper scale",
    huang_pair={"t5_small": ("translation", "T5-small"), "t5_small_xsum": ("summarization", "T5-small-XSum")},
    huang_models="T5-large with t5-small and Muennighoff/t5-small-finetuned-xsum-512 (translation English->German)",
    held_out="the test-split",
    alpha_arms=("early_exit_4", "early_exit_12"),
    alpha_note="LayerSkip Llama-3.2-1B's trained exits after 4 (cheap) and 12 (dearer, better aligned) of 16 layers, on XSum",
    depth_note="LayerSkip Llama-3.2-1B's trained exits after 4, 8 and 12 of 16 layers, on XSum",
    training_note="the policy trains on the collected train-split queries, up to all of them.",
    metasd=(
        MetaRun(
            METASD_EVAL,
            "metasd/main",
            "MetaSD, black-box: task-specialised 68M drafters, baselines and bandits on Spec-Bench",
            {
                "code": "coding",
                "qa": "qa",
                "summarization": "summarization",
                "math": "math_reasoning",
                "translation": "translation",
            },
            None,
            "MetaSpS-UCB",
            "Vicuna-7B v1.3 on Spec-Bench's question.jsonl, every turn",
        ),
        MetaRun(
            METASD_EAGLE,
            "metasd/whitebox",
            "MetaSD, white-box: EAGLE-1 heads (the published one and one per task), baselines and bandits",
            {
                "eagle_code": "coding",
                "eagle_qa": "qa",
                "eagle_summarization": "summarization",
                "eagle_math": "math_reasoning",
                "eagle_translation": "translation",
            },
            "eagle",
            "MetaEagle-UCB",
            "Vicuna-7B v1.3 on Spec-Bench's question.jsonl, every turn",
        ),
    ),
    tasks=None,
    task_columns={"coding": "code"},
    stream_note=(
        "Spec-Bench's questions in file order (category blocks); the task changes between the questions of "
        "the stream, not inside one conversation."
    ),
)

LAYOUTS = {lay.name: lay for lay in (CPU, PAPER)}
