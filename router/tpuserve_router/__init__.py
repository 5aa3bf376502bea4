"""The prefix-aware router: SGLang's and OpenAI's API in front of the model-server replicas."""
