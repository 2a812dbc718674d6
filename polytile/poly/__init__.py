"""The polyhedral layer, the only package that imports islpy."""
