"""Agents: the LangGraph graph, the four roles, model backends, prompts and skills."""
