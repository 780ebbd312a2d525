"""Fakes that ship with the library so users can test their own agents offline.

- ``hindsight_loop.testing.llm_server``: a real HTTP server on 127.0.0.1 that speaks the OpenAI
  chat-completions and Anthropic Messages protocols and replays scripted answers and faults.
- ``hindsight_loop.testing.llm``: a scripted fake LLM and a function-backed LLM (no network).
- ``hindsight_loop.testing.embed``: a fake embedder whose similarities mean something.
"""
