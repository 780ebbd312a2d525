"""``hindsight llm``: see which model reflection will use, and check that it answers.

Reflection runs in the background where its failures are only recorded, so a wrong URL or key
would otherwise show up as a pile of failed reflections; ``hindsight llm check`` says it at once.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hindsight_loop.cli.common import JsonOption, fail, print_json, say
from hindsight_loop.llm import LLMConfig, LLMConfigError, LLMError, connect
from hindsight_loop.llm.parse import extract_json

llm_app = typer.Typer(
    help="The LLM used for reflection, configured by HINDSIGHT_LLM_* environment variables.",
    no_args_is_help=True,
)

NOT_CONFIGURED = (
    "no LLM is configured, so reflection uses the offline reflector. To use a model, set "
    "HINDSIGHT_LLM_PROVIDER (openai|anthropic) and HINDSIGHT_LLM_MODEL, plus HINDSIGHT_LLM_BASE_URL "
    "for an OpenAI-compatible server (e.g. http://localhost:11434/v1) and HINDSIGHT_LLM_API_KEY"
)
CHECK_PROMPT = 'Reply with the JSON object {"ok": true} and nothing else.'


def register(app: typer.Typer) -> None:
    app.add_typer(llm_app, name="llm")


def _config() -> LLMConfig | None:
    try:
        return LLMConfig.from_env()
    except LLMConfigError as exc:
        raise fail(str(exc)) from None


def _describe(config: LLMConfig | None) -> dict[str, Any]:
    if config is None:
        return {"provider": "offline", "configured": False}
    return {
        "provider": config.provider,
        "configured": True,
        "base_url": config.base_url,
        "model": config.model,
        "local_model": config.local_model or config.model,
        "api_key": "set" if config.api_key else "from the SDK's environment variable",
        "timeout": config.timeout,
        "temperature": config.temperature,
        "max_tokens": config.max_tokens,
        "language": config.language or "follows the run",
    }


@llm_app.command("config")
def show_config(json_out: JsonOption = False) -> None:
    """Show the LLM configuration read from HINDSIGHT_LLM_* (no request is made)."""
    info = _describe(_config())
    if json_out:
        print_json(info)
        return
    if not info["configured"]:
        say(f"offline: {NOT_CONFIGURED}")
        return
    for key, value in info.items():
        if key != "configured":
            say(f"{key:12} {value}")


@llm_app.command("check")
def check(
    json_out: JsonOption = False,
    local: Annotated[
        bool, typer.Option("--local/--no-local", help="Also check the local-review model.")
    ] = True,
    judge: Annotated[
        bool,
        typer.Option(
            "--judge",
            help="Also put the model to the pair judge's six check pairs (six more requests): "
            "curation uses its word on lesson pairs only if it answers them all right.",
        ),
    ] = False,
) -> None:
    """Send one tiny JSON request to the configured model(s); report model, latency and tokens."""
    config = _config()
    if config is None:
        raise fail(NOT_CONFIGURED)
    models = [config.model]
    if local and config.local_model and config.local_model != config.model:
        models.append(config.local_model)
    try:
        llm = connect(config)
    except (ImportError, LLMConfigError) as exc:
        raise fail(str(exc)) from None
    results: list[dict[str, Any]] = []
    try:
        for model in models:
            try:
                answer = llm.complete(CHECK_PROMPT, model=model, json_mode=True, max_tokens=64)
            except LLMError as exc:
                results.append({"model": model, "ok": False, "error": str(exc)})
                continue
            results.append(
                {
                    "model": model,
                    "ok": True,
                    "answered_by": answer.model,
                    "json": extract_json(answer.text) is not None,
                    "latency_ms": round(answer.latency_ms, 1),
                    "tokens_in": answer.tokens_in,
                    "tokens_out": answer.tokens_out,
                    "answer": answer.text[:200],
                }
            )
        judged = _judge_check(llm) if judge and results[0]["ok"] else None
    finally:
        llm.close()
    failed = [r for r in results if not r["ok"]]
    if json_out:
        out = {"provider": config.provider, "base_url": config.base_url, "results": results}
        print_json(out if judged is None else {**out, "judge": judged})
    else:
        for r in results:
            if r["ok"]:
                json_note = (
                    "JSON ok"
                    if r["json"]
                    else "answer is not JSON (parsing will repair or mark it suspect)"
                )
                say(
                    f"ok  {config.provider}:{r['model']} answered by {r['answered_by']} in "
                    f"{r['latency_ms']} ms, {r['tokens_in']}+{r['tokens_out']} tokens, {json_note}"
                )
            else:
                say(f"err {config.provider}:{r['model']}: {r['error']}", err=True)
        if judged is not None:
            say(judged["summary"])
    if judged is not None and judged["trusted"] is None:
        raise fail("the pair judge's check pairs got no answer: the model cannot judge lessons now")
    if failed:
        raise fail(
            "the model did not answer: check HINDSIGHT_LLM_BASE_URL, HINDSIGHT_LLM_MODEL and "
            "HINDSIGHT_LLM_API_KEY (or raise HINDSIGHT_LLM_TIMEOUT)"
        )


def _judge_check(llm: Any) -> dict[str, Any]:
    """The pair judge's check pairs (``llm.judge.CANARIES``), as curation puts them to the model."""
    from hindsight_loop.llm.judge import MAX_UNREADABLE, PairJudge

    judge = PairJudge(llm, check_retry_seconds=0)
    for _ in range(MAX_UNREADABLE):  # as curation would, over its attempts, but now
        trusted = judge.qualify()
        if trusted is not None:
            break
    missed = [
        {"a": a, "b": b, "expected": want, "answered": got} for a, b, want, got in judge.missed
    ]
    consequence = {
        None: " (see the warning above)",
        True: ": curation uses its word",
        False: ": curation will not use it and keeps its rules' decisions",
    }[trusted]
    summary = f"judge: {judge.outcome()}{consequence}"
    return {"trusted": trusted, "missed": missed, "summary": summary}
