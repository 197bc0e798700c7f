"""The preprocessor's pure logic: model artifacts, message normalisation, templates, prompts."""
