"""Google's Gemini API (generateContent, streamGenerateContent, countTokens), managed in its own shape."""
