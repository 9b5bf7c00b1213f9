package migrations

// Files and VersionTable let the external tests migrate to a given version.
var (
	Files        = files
	VersionTable = versionTable
)
