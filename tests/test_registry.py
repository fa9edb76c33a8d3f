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
    ],
)
def test_known_targets(target, drafter):
    assert drafter_for(target) == drafter


def test_unknown_target():
    assert drafter_for("mistralai/Mistral-7B-Instruct-v0.3") is None
    assert base_name("Qwen/Qwen3.5-4B") == "qwen3.5-4b"
