"""The conversation: chat messages and the chat template.

:mod:`~srt_agent.chat.messages` holds the messages; :mod:`~srt_agent.chat.template` turns them into
tokens and back. Nothing is imported here, so envs can use messages without loading a tokenizer.
"""
