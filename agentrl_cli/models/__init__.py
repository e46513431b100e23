"""Models: loading policies/critics/references and the tiny built-in agent."""
