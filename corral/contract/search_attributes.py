"""The typed keys of corral's search attributes, each built once from its name, for every reader and writer.

The names stay where they are public and free of Temporal (`corral.names`: a session's status and model;
`corral.contract.records`: a record's kind, workspace and archive mark), since `sandbox/` and `proxy/` import those
modules and must not load Temporal. The keys need `temporalio.common`, so they live here, one import away.
"""

from __future__ import annotations

from typing import Final

from temporalio.common import SearchAttributeKey

from corral.contract.records import SEARCH_ATTRIBUTE_ARCHIVED, SEARCH_ATTRIBUTE_KIND, SEARCH_ATTRIBUTE_WORKSPACE
from corral.names import SEARCH_ATTRIBUTE_MODEL, SEARCH_ATTRIBUTE_STATUS

STATUS_KEY: Final = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_STATUS)
"""A session's status (`corral.names.SessionStatus`), set by its workflow."""
MODEL_KEY: Final = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_MODEL)
"""A session's model, set by its workflow."""
KIND_KEY: Final = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_KIND)
"""A record's kind (agent, environment, vault...)."""
WORKSPACE_KEY: Final = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_WORKSPACE)
"""The workspace a session or a record belongs to."""
ARCHIVED_KEY: Final = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_ARCHIVED)
"""A record's archive mark, "true" or "false"."""
