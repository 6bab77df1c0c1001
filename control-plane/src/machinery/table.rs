//! The column definitions of a meta.k8s.io/v1 Table (k8s-openapi has no Table types), in the
//! JSON shape kubectl reads. Rows are plain JSON cells built by each kind in `kinds/`.

use serde::{Deserialize, Serialize};

/// One column of a Table. Wide columns (`kubectl get -o wide`) have priority 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableColumnDefinition {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i32,
}

/// The value type of a column, as the Table schema names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    String,
    Integer,
    Number,
    Boolean,
    Date,
}

impl ColumnType {
    fn as_str(self) -> &'static str {
        match self {
            ColumnType::String => "string",
            ColumnType::Integer => "integer",
            ColumnType::Number => "number",
            ColumnType::Boolean => "boolean",
            ColumnType::Date => "date",
        }
    }
}

impl TableColumnDefinition {
    pub fn new(name: &str, type_: ColumnType, description: &str) -> Self {
        TableColumnDefinition {
            name: name.to_string(),
            type_: type_.as_str().to_string(),
            format: String::new(),
            description: description.to_string(),
            priority: 0,
        }
    }

    /// The NAME column (format `name`, which kubectl uses for `-o name` style output).
    pub fn name_column() -> Self {
        let mut c = TableColumnDefinition::new(
            "Name",
            ColumnType::String,
            "Name must be unique within a namespace.",
        );
        c.format = "name".to_string();
        c
    }

    /// The AGE column.
    pub fn age_column() -> Self {
        TableColumnDefinition::new(
            "Age",
            ColumnType::String,
            "CreationTimestamp is a timestamp representing the server time when this object was created.",
        )
    }

    /// Shown only by `kubectl get -o wide`.
    pub fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
}
