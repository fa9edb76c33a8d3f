import pytest

from dflash_mlx.loading.registry import base_name, drafter_for


@pytest.mark.parametrize(
    "target, drafter",
    [
        ("Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash"),
        ("mlx-community/Qwen3.5-4B-4bit", "z-lab/Qwen3.5-4B-DFlash"),
        ("mlx-community/Qwen3.5-9B-MLX-8bit", "z-lab/Qwen3.5-9B-DFlash"),
        ("mlx-community/Qwen3-4B-bf16", "z-lab/Qwen3-4B-DFlash-b16"),
        ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16"),
        ("mlx-community/Qwen3.6-35B-A3B-4bit-DWQ", "z-lab/Qwen3.6-35B-A3B-DFlash"),
        (
            "meta-llama/Llama-3.1-8B-Instruct",
            "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
        ),
        (
            "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
            "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
        ),
        ("openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash"),
        ("mlx-community/gpt-oss-120b-MXFP4-Q8", "z-lab/gpt-oss-120b-DFlash"),
        (
            "~/models/Qwen3-Coder-30B-A3B-Instruct-8bit/",
            "z-lab/Qwen3-Coder-30B-A3B-DFlash",
        ),
        ("google/gemma-4-31B-it", "z-lab/gemma-4-31B-it-DFlash"),
        ("mlx-community/gemma-4-31b-it-4bit", "z-lab/gemma-4-31B-it-DFlash"),
        ("mlx-community/gemma-4-31b-it-qat-4bit", "z-lab/gemma-4-31B-it-DFlash"),
        ("mlx-community/gemma-4-26b-a4b-it-4bit", "z-lab/gemma-4-26B-A4B-it-DFlash"),
        ("google/gemma-4-12B-it", "z-lab/gemma4-12B-it-DFlash"),
        ("mlx-community/Qwen3.8-27B-4bit", "z-lab/Qwen3.8-27B-DFlash2"),
        ("meta-models/Muse-Glimmer-30B", "z-lab/Muse-Glimmer-30B-DFlash2"),
        ("mlx-community/Muse-Glimmer-30B-8bit", "z-lab/Muse-Glimmer-30B-DFlash2"),
        ("mlx-community/Qwen3.5-397B-A17B-4bit", "z-lab/Qwen3.5-397B-A17B-DFlash"),
        ("moonshotai/Kimi-K2.6", "z-lab/Kimi-K2.6-DFlash"),
        ("MiniMaxAI/MiniMax-M2.7", "z-lab/MiniMax-M2.7-DFlash"),
        ("zai-org/GLM-5.1-FP8", "z-lab/GLM-5.1-FP8-DFlash"),
        ("mlx-community/GLM-5.1-4bit", "z-lab/GLM-5.1-FP8-DFlash"),
    ],
)
def test_known_targets(target, drafter):
    assert drafter_for(target) == drafter


def test_unknown_target():
    assert drafter_for("mistralai/Mistral-7B-Instruct-v0.3") is None
    assert drafter_for("google/gemma-4-31B") is None  # the base model, not the -it
    assert base_name("Qwen/Qwen3.5-4B") == "qwen3.5-4b"
